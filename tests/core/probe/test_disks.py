"""Disk probe: the mount, device, filesystem and spinning-or-not of the models folder, on fake
/proc/mounts + /sys/block trees built per test; the parsers on their own; the live machine."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from hearthside.core.probe import disks
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.profile import DiskInfo

pytestmark = pytest.mark.beside

MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p2 / ext4 rw,relatime,errors=remount-ro 0 0
/dev/nvme0n1p1 /boot/efi vfat rw,relatime,fmask=0077,dmask=0077 0 0
tmpfs /run tmpfs rw,nosuid,nodev,noexec,relatime,size=3256376k,mode=755 0 0
/dev/sda1 /data xfs rw,relatime,attr2,inode64,logbufs=8,logbsize=32k,noquota 0 0
/dev/mapper/vg0-models /srv/llm\\040models btrfs rw,noatime,ssd,space_cache=v2 0 0
overlay /var/lib/docker/overlay2/abc/merged overlay rw,relatime,lowerdir=/l,upperdir=/u 0 0
"""


def fake_machine(root: Path, models_dir: str) -> ProbeContext:
    files = {
        "proc/mounts": MOUNTS,
        "sys/block/nvme0n1/queue/rotational": "0\n",
        "sys/block/nvme1n1/queue/rotational": "0\n",
        "sys/block/sda/queue/rotational": "1\n",
        "sys/block/sda/queue/read_ahead_kb": "128\n",
        "sys/block/dm-0/queue/rotational": "0\n",
        "sys/block/dm-0/queue/read_ahead_kb": "4096\n",
        "sys/block/nvme1n1/queue/read_ahead_kb": "128\n",
        "sys/block/dm-0/dm/name": "vg0-models\n",
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    # real sysfs: slaves/ holds links named after the member devices
    (root / "sys/block/dm-0/slaves/nvme1n1p1").mkdir(parents=True)
    return ProbeContext(root=root, platform="linux", models_dir=Path(models_dir))


def probe_disk(root: Path, models_dir: str) -> DiskInfo:
    result = disks.probe(fake_machine(root, models_dir))
    assert result.errors == ()
    (disk,) = result.disks
    return disk


def test_nvme_partition_maps_to_its_disk(tmp_path: Path) -> None:
    disk = probe_disk(tmp_path, "/home/ana/.local/share/hearthside/models")
    assert disk == DiskInfo(
        path="/home/ana/.local/share/hearthside/models",
        mount_point="/",
        device="/dev/nvme0n1p2",
        filesystem="ext4",
        rotational=False,
    )


def test_hard_disk_mount_is_rotational(tmp_path: Path) -> None:
    disk = probe_disk(tmp_path, "/data/models")
    assert (disk.mount_point, disk.device, disk.filesystem) == ("/data", "/dev/sda1", "xfs")
    assert disk.rotational is True
    assert disk.total_bytes is None and disk.free_bytes is None  # not the live machine


def test_device_mapper_volume_follows_its_slaves(tmp_path: Path) -> None:
    disk = probe_disk(tmp_path, "/srv/llm models/gguf")
    assert disk.mount_point == "/srv/llm models"
    assert (disk.device, disk.filesystem) == ("/dev/mapper/vg0-models", "btrfs")
    assert disk.rotational is False  # nvme1n1p1 under dm-0


def test_read_ahead_is_the_mounted_devices_own(tmp_path: Path) -> None:
    # a partition reads through its disk's queue; a dm volume has its own read-ahead, not
    # its members'; a disk whose sysfs has no read_ahead_kb is unknown
    assert probe_disk(tmp_path / "a", "/data/models").read_ahead_bytes == 128 * 1024
    assert probe_disk(tmp_path / "b", "/srv/llm models/gguf").read_ahead_bytes == 4096 * 1024
    assert probe_disk(tmp_path / "c", "/home/ana/models").read_ahead_bytes is None


def test_overlay_has_no_block_device_to_ask(tmp_path: Path) -> None:
    disk = probe_disk(tmp_path, "/var/lib/docker/overlay2/abc/merged/models")
    assert (disk.filesystem, disk.rotational) == ("overlay", None)


def test_no_models_dir_means_no_disk_entry() -> None:
    assert disks.probe(ProbeContext(models_dir=None)).disks == ()


def test_missing_proc_mounts_is_an_error_with_the_path_kept(tmp_path: Path) -> None:
    ctx = ProbeContext(root=tmp_path, platform="linux", models_dir=Path("/models"))
    result = disks.probe(ctx)
    assert result.disks == (DiskInfo(path="/models"),)
    assert [error.source for error in result.errors] == ["disks"]


def test_find_mount_picks_the_longest_whole_component_match() -> None:
    mounts = disks.parse_proc_mounts(MOUNTS + "/dev/sdb1 /data/models2 ext4 rw 0 0\n")
    mount = disks.find_mount(mounts, PurePosixPath("/data/models/x.gguf"))
    assert mount is not None and mount.mount_point == "/data"


def test_parse_proc_mounts_unescapes_spaces() -> None:
    mounts = disks.parse_proc_mounts("/dev/sdc1 /media/ana/My\\040Drive exfat rw 0 0\n")
    assert mounts == [disks.Mount("/dev/sdc1", "/media/ana/My Drive", "exfat")]


@pytest.mark.parametrize(
    ("partition", "disk"),
    [
        ("nvme0n1p2", "nvme0n1"),
        ("nvme10n1p12", "nvme10n1"),
        ("sda3", "sda"),
        ("xvda1", "xvda"),
        ("mmcblk0p1", "mmcblk0"),
        ("nvme0n1", "nvme0n1"),
        ("sda", "sda"),
        ("dm-0", "dm-0"),
    ],
)
def test_parent_disk_name(partition: str, disk: str) -> None:
    assert disks.parent_disk_name(partition) == disk


def test_live_machine_reports_space_for_the_models_dir(tmp_path: Path) -> None:
    models_dir = tmp_path / "not-yet-created"
    result = disks.probe(ProbeContext(models_dir=models_dir))
    assert result.errors == ()
    (disk,) = result.disks
    assert disk.path == str(models_dir)
    assert disk.total_bytes is not None and disk.free_bytes is not None
    assert 0 <= disk.free_bytes <= disk.total_bytes


def test_a_virtio_disk_does_not_claim_to_spin(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "mounts").write_text("/dev/vda / ext4 rw,relatime 0 0\n")
    queue = root / "sys" / "block" / "vda" / "queue"
    queue.mkdir(parents=True)
    (queue / "rotational").write_text("1\n")
    result = disks.probe(ProbeContext(root=root, models_dir=Path("/srv/models")))
    assert result.disks[0].rotational is None
    assert result.disks[0].read_ahead_bytes is None  # no read_ahead_kb in this fake queue
