"""Hub search, listing, names and the URL rules, against a real local HTTP hub."""

from __future__ import annotations

import hashlib
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthside.core.models.hub import (
    HubFile,
    HubFilePart,
    list_repo_gguf_files,
    parse_pull_ref,
    parse_quant,
    pick_by_quant,
    resolve_url,
    search_models,
    split_part_info,
    validate_repo_filename,
    validate_repo_id,
)
from hearthside.core.models.hub_http import (
    MAX_REDIRECTS,
    CheckedURL,
    HubEndpoint,
    HubError,
    UnsafeURLError,
    check_url,
    open_url,
    send_checked,
)
from hearthside.core.serialize import from_jsonable, to_jsonable
from hearthside.core.settings import Settings
from tests.hub_server import COMMIT_SHA, HubServer

pytestmark = pytest.mark.beside

HF = HubEndpoint("https://huggingface.co")


def tiny_file(directory: Path, name: str, content: bytes) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubServer]:
    """A hub with three repos; listing tests only read metadata, so the bytes are small."""
    with HubServer() as server:
        state = server.state
        for name, size in (("Q2_K", 100), ("Q4_K_M", 170), ("Q8_0", 280), ("BF16", 540)):
            filename = f"Gemma-3-270M-it-{name}.gguf"
            path = tiny_file(tmp_path, filename, name.encode()[:1] * size)
            state.add_file("acme/gemma-3-270m-it-GGUF", filename, path)
        for index in (1, 2, 3):
            filename = f"Q4_K_M/Big-Q4_K_M-0000{index}-of-00003.gguf"
            state.add_file("acme/big-GGUF", filename, tiny_file(tmp_path, filename, b"x" * index))
        # Only two of three parts: not loadable, so not offered.
        for index in (1, 2):
            filename = f"Q8_0/Big-Q8_0-0000{index}-of-00003.gguf"
            state.add_file("acme/big-GGUF", filename, tiny_file(tmp_path, filename, b"y"))
        state.repos["acme/big-GGUF"].extra_siblings += [
            {"rfilename": "../escape.gguf", "size": 1},
            {"rfilename": "/etc/passwd.gguf", "size": 1},
            {"rfilename": "dir/../../x.gguf", "size": 1},
            {"rfilename": "mmproj-Big-F16.gguf", "size": 5, "lfs": {"sha256": "0" * 64}},
            {"rfilename": "weights.safetensors", "size": 5},
            {"rfilename": "odd name.gguf", "size": 5},
        ]
        state.repos["acme/big-GGUF"].downloads = 5
        state.repos["acme/gemma-3-270m-it-GGUF"].downloads = 900
        state.add_file("other/llama-GGUF", "llama.Q4_0.gguf", tiny_file(tmp_path, "l.gguf", b"l"))
        yield server


@pytest.fixture
def endpoint(hub: HubServer) -> HubEndpoint:
    return HubEndpoint(hub.url, allow_insecure_loopback=True)


# --- search and listing ----------------------------------------------------------------------


def test_search_asks_for_gguf_repos_and_parses_results(
    hub: HubServer, endpoint: HubEndpoint
) -> None:
    results = search_models("GGUF", limit=2, endpoint=endpoint)

    assert [r.repo for r in results] == ["acme/gemma-3-270m-it-GGUF", "acme/big-GGUF"]
    assert results[0].downloads == 900
    assert results[0].last_modified == "2025-08-14T12:00:00.000Z"
    [request] = hub.state.requests
    assert request.path == "/api/models"
    assert request.query["filter"] == ["gguf"]
    assert request.query["search"] == ["GGUF"]
    assert request.query["limit"] == ["2"]


def test_listing_reports_sizes_sha256_quant_and_pins_the_commit(
    endpoint: HubEndpoint, tmp_path: Path
) -> None:
    files = list_repo_gguf_files("acme/gemma-3-270m-it-GGUF", endpoint=endpoint)

    assert [f.quant for f in files] == ["Q2_K", "Q4_K_M", "Q8_0", "BF16"]  # smallest first
    q8 = files[2]
    content = (tmp_path / "Gemma-3-270M-it-Q8_0.gguf").read_bytes()
    assert q8.filename == "Gemma-3-270M-it-Q8_0.gguf"
    assert q8.size_bytes == len(content)
    assert q8.sha256 == hashlib.sha256(content).hexdigest()
    assert q8.revision == COMMIT_SHA
    assert not q8.is_split
    assert from_jsonable(HubFile, to_jsonable(q8)) == q8


def test_listing_groups_split_parts_and_leaves_out_what_is_not_a_safe_model(
    endpoint: HubEndpoint,
) -> None:
    [big] = list_repo_gguf_files("acme/big-GGUF", endpoint=endpoint)

    assert big.is_split
    assert big.filenames == tuple(f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    assert big.size_bytes == 1 + 2 + 3
    assert big.quant == "Q4_K_M"
    assert big.display_name == "Q4_K_M/Big-Q4_K_M.gguf (3 parts)"


def test_an_unknown_repo_is_a_plain_error(endpoint: HubEndpoint) -> None:
    with pytest.raises(HubError, match="HTTP 404") as raised:
        list_repo_gguf_files("acme/nothing-here", endpoint=endpoint)
    assert "hearthside models search" in (raised.value.hint or "")


def test_pick_by_quant_names_the_choices(endpoint: HubEndpoint) -> None:
    files = list_repo_gguf_files("acme/gemma-3-270m-it-GGUF", endpoint=endpoint)

    assert pick_by_quant(files, "q4_k_m").filename == "Gemma-3-270M-it-Q4_K_M.gguf"
    with pytest.raises(HubError, match="no IQ4_XS file") as raised:
        pick_by_quant(files, "IQ4_XS")
    assert raised.value.hint == "Available: BF16, Q2_K, Q4_K_M, Q8_0."


# --- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "quant"),
    [
        ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M"),
        ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "Q4_K_XL"),
        ("phi-2.Q8_0.gguf", "Q8_0"),
        ("Meta-Llama-3.1-8B-Instruct-IQ4_XS.gguf", "IQ4_XS"),
        ("gemma-3-4b-it-IQ2_XXS.gguf", "IQ2_XXS"),
        ("model-BF16.gguf", "BF16"),
        ("model.fp16.gguf", "F16"),
        ("mistral_7b_instruct_q5_k_m.gguf", "Q5_K_M"),
        ("UD-IQ1_S/DeepSeek-R1-UD-IQ1_S-00001-of-00003.gguf", "IQ1_S"),
        ("Q8_0/model-00002-of-00002.gguf", "Q8_0"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("llama-7b.gguf", None),
    ],
)
def test_quant_is_read_from_the_file_name(filename: str, quant: str | None) -> None:
    assert parse_quant(filename) == quant


def test_split_part_names() -> None:
    assert split_part_info("a/Big-Q4_K_M-00002-of-00003.gguf") == ("a/Big-Q4_K_M", 2, 3)
    assert split_part_info("Big-00004-of-00003.gguf") is None
    assert split_part_info("Big-00001-of-00003.gguf.part") is None
    assert split_part_info("Big.gguf") is None


@pytest.mark.parametrize(
    "filename",
    [
        "../model.gguf",
        "a/../../model.gguf",
        "/etc/model.gguf",
        "a//model.gguf",
        "a\\model.gguf",
        "model.bin",
        ".gguf",
        "model.gguf/",
        "%2e%2e/model.gguf",
        "my model.gguf",
        "modèle.gguf",
        "a/b/c/d/e/model.gguf",
        "x..y.gguf",
        "",
    ],
)
def test_hostile_file_names_are_refused(filename: str) -> None:
    with pytest.raises(HubError, match="not a file name Hearthside downloads"):
        validate_repo_filename(filename)


@pytest.mark.parametrize(
    "repo", ["owner", "owner/name/extra", "../name", "owner/..", "own er/name", "/name", "o/n?x"]
)
def test_bad_repo_ids_are_refused(repo: str) -> None:
    with pytest.raises(HubError, match="not a hub repo id"):
        validate_repo_id(repo)


@given(st.text(alphabet=st.sampled_from("ab./-_%\\:\x00é"), max_size=24))
def test_any_accepted_file_name_stays_inside_the_repo(filename: str) -> None:
    try:
        validate_repo_filename(filename)
    except HubError:
        return
    components = filename.split("/")
    assert not filename.startswith("/")
    assert all(component not in ("", ".", "..") for component in components)
    assert set(filename) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/"
    )
    assert filename.endswith(".gguf")


def test_pull_refs() -> None:
    assert parse_pull_ref("acme/m-GGUF") == ("acme/m-GGUF", None)
    assert parse_pull_ref("acme/m-GGUF:sub/m-Q4_0.gguf") == ("acme/m-GGUF", "sub/m-Q4_0.gguf")
    with pytest.raises(HubError):
        parse_pull_ref("acme/m-GGUF:../m.gguf")


def test_resolve_url_is_built_from_checked_parts() -> None:
    url = resolve_url(HF, "acme/m-GGUF", "main", "sub/m-Q4_0.gguf")
    assert url == "https://huggingface.co/acme/m-GGUF/resolve/main/sub/m-Q4_0.gguf"
    with pytest.raises(HubError):
        resolve_url(HF, "acme/m-GGUF", "../../x", "m.gguf")


# --- the endpoint and URL rules --------------------------------------------------------------


def public(*addresses: str):  # noqa: ANN201 - a resolver for check_url
    return lambda host, port: list(addresses)


@pytest.mark.parametrize(
    ("url", "allow_loopback"),
    [
        ("http://huggingface.co", False),
        ("http://example.com", True),  # the test flag never covers a real host
        ("http://127.0.0.1:8080", False),  # loopback http needs the flag
        ("https://10.0.0.5", False),
        ("https://127.0.0.1", False),
        ("https://user:secret@huggingface.co", False),
        ("https://huggingface.co/some/path", False),
        ("ftp://huggingface.co", False),
    ],
)
def test_unsafe_endpoints_are_refused(url: str, allow_loopback: bool) -> None:
    with pytest.raises(UnsafeURLError, match="not allowed"):
        HubEndpoint(url, allow_insecure_loopback=allow_loopback)


def test_settings_cannot_switch_off_https_for_a_real_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTHSIDE_HUB_ENDPOINT", "http://hub.example.org")
    monkeypatch.setenv("HEARTHSIDE_HUB_ALLOW_INSECURE_LOOPBACK", "true")
    with pytest.raises(UnsafeURLError):
        HubEndpoint.from_settings(Settings())
    monkeypatch.setenv("HEARTHSIDE_HUB_ENDPOINT", "http://127.0.0.1:9")
    assert HubEndpoint.from_settings(Settings()).url == "http://127.0.0.1:9"
    monkeypatch.delenv("HEARTHSIDE_HUB_ENDPOINT")
    assert HubEndpoint.from_settings(Settings()).url == "https://huggingface.co"


@pytest.mark.parametrize(
    ("url", "addresses", "why"),
    [
        ("https://127.0.0.1/x.gguf", ("127.0.0.1",), "IP address"),
        ("https://[::1]/x.gguf", ("::1",), "IP address"),
        ("https://cdn-lfs.hf.co/x", ("127.0.0.1",), "private or local"),
        ("https://cdn-lfs.hf.co/x", ("10.1.2.3",), "private or local"),
        ("https://cdn-lfs.hf.co/x", ("169.254.169.254",), "private or local"),
        ("https://cdn-lfs.hf.co/x", ("::ffff:192.168.1.1",), "private or local"),
        ("https://cdn-lfs.hf.co/x", ("18.1.2.3", "192.168.0.7"), "private or local"),
        ("https://cas-bridge.xethub.hf.co/x", ("100.64.0.1",), "private or local"),
        ("http://cdn-lfs.hf.co/x", ("18.1.2.3",), "only https"),
        ("https://evil.example.com/x", ("18.1.2.3",), "not the model hub"),
        ("https://huggingface.co.evil.com/x", ("18.1.2.3",), "not the model hub"),
        ("https://cdn-lfs.hf.co.evil.com/x", ("18.1.2.3",), "not the model hub"),
        ("https://user:pw@huggingface.co/x", ("18.1.2.3",), "not a plain web address"),
    ],
)
def test_urls_outside_the_hub_are_refused(url: str, addresses: tuple[str, ...], why: str) -> None:
    with pytest.raises(UnsafeURLError, match=why):
        check_url(url, HF, public(*addresses))


def test_hub_and_cdn_urls_pass_and_only_the_hub_gets_the_token() -> None:
    hub = check_url("https://huggingface.co/a/b/resolve/main/x.gguf", HF, public("18.1.2.3"))
    cdn = check_url("https://cdn-lfs-us-1.hf.co/repos/x?sig=1", HF, public("2600:9000::1"))
    xet = check_url("https://cas-bridge.xethub.hf.co/xet-bridge-us/x", HF, public("3.5.6.7"))

    assert (hub.is_endpoint, hub.addresses, hub.port) == (True, ("18.1.2.3",), 443)
    assert (cdn.is_endpoint, cdn.request_target) == (False, "/repos/x?sig=1")
    assert cdn.addresses == ("2600:9000::1",)
    assert not xet.is_endpoint


def test_a_redirect_off_the_test_endpoint_is_refused(hub: HubServer, endpoint: HubEndpoint) -> None:
    url = resolve_url(endpoint, "other/llama-GGUF", "main", "llama.Q4_0.gguf")
    other_port = "http://127.0.0.1:1/x.gguf"
    for location, why in [
        (other_port, "only https"),
        ("https://127.0.0.1/x.gguf", "IP address"),
        ("https://evil.example.com/x.gguf", "not the model hub"),
    ]:
        hub.state.redirect_location = location
        with pytest.raises(UnsafeURLError, match=why):
            open_url(url, endpoint)
    assert hub.state.file_requests() == []


def test_redirect_loops_stop(hub: HubServer, endpoint: HubEndpoint) -> None:
    url = resolve_url(endpoint, "other/llama-GGUF", "main", "llama.Q4_0.gguf")
    hub.state.redirect_location = url
    with pytest.raises(HubError, match=f"more than {MAX_REDIRECTS} times"):
        open_url(url, endpoint)
    assert len(hub.state.requests) == MAX_REDIRECTS + 1


def test_the_token_goes_to_the_hub_endpoint(hub: HubServer) -> None:
    endpoint = HubEndpoint(hub.url, allow_insecure_loopback=True, token="hf_secret")
    assert "hf_secret" not in repr(endpoint)
    list_repo_gguf_files("other/llama-GGUF", endpoint=endpoint)
    assert hub.state.requests[-1].authorization == "Bearer hf_secret"


def test_hub_file_properties() -> None:
    parts = (
        HubFilePart("m-00001-of-00002.gguf", 5, "a" * 64),
        HubFilePart("m-00002-of-00002.gguf", None, None),
    )
    hub_file = HubFile("acme/m", parts, "Q4_0")
    assert hub_file.size_bytes is None
    assert hub_file.sha256 == "a" * 64
    assert hub_file.source == "hub:acme/m/m-00001-of-00002.gguf"


# --- TLS -------------------------------------------------------------------------------------


class _EchoHost(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        return

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        body = (self.headers.get("Host") or "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """An https server on 127.0.0.1 with a self-signed certificate for cdn-lfs.hf.co."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=cdn-lfs.hf.co", "-addext", "subjectAltName=DNS:cdn-lfs.hf.co"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server = HTTPServer(("127.0.0.1", 0), _EchoHost)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield int(server.server_address[1]), cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_tls_checks_the_hub_name_while_connecting_to_the_checked_address(
    tls_server: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, cert = tls_server
    url = f"https://cdn-lfs.hf.co:{port}/x"
    # As if DNS had answered 127.0.0.1 and check_url had let it through: the socket goes to
    # exactly that address, no second lookup, and TLS still verifies the hub's name.
    checked = CheckedURL(url, "https", "cdn-lfs.hf.co", port, "/x", ("127.0.0.1",), False)

    with pytest.raises(HubError, match="(?i)certificate verify failed"):
        send_checked(checked, HF, {})

    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # now the system trusts this certificate
    sent = send_checked(checked, HF, {})
    try:
        assert sent.response.status == 200
        assert sent.response.read() == f"cdn-lfs.hf.co:{port}".encode()
    finally:
        sent.connection.close()
