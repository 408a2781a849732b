"""A window that streams one long reply and reports what it has shown, for the kill -9 test.

    python tests/app/gui/streaming_window.py MODEL_PATH

Runs with HEARTHSIDE_HOME and QT_QPA_PLATFORM from the environment. Prints `shown <n>` (the
reply's length on screen) after every flush; the test kills it with SIGKILL mid-reply.
"""

from __future__ import annotations

import sys

from hearthside.app.gui.app import create_application
from hearthside.app.gui.chat_settings_dialog import ChatSettings
from hearthside.app.gui.main_window import MainWindow
from hearthside.app.gui.model_loader import LoadOptions
from hearthside.app.gui.reply_writer import SavedText
from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.service import EngineService

PROMPT = "Write a very long story about a dragon who learns to bake bread."


def main(model_path: str) -> int:
    app = create_application(sys.argv[:1])
    service = EngineService().start()
    window = MainWindow(service, load_options=LoadOptions(n_ctx=2048))
    window.show()

    def send_when_loaded(_loaded: object) -> None:
        window.session.apply_settings(
            ChatSettings("", SamplingParams(temperature=0.0, max_tokens=1500))
        )
        window.chat_pane.input.setPlainText(PROMPT)
        window.chat_pane.submit()
        print(f"conversation {window.session.current_id}", flush=True)

    def report_shown(saved: SavedText) -> None:
        # Connected after the session's own slot: this runs once the text is saved and shown.
        print(f"shown {len(saved.text)}", flush=True)

    def finished(_result: GenerationResult) -> None:
        print("finished", flush=True)

    window.bridge.load_finished.connect(send_when_loaded)
    window.reply_writer.saved.connect(report_shown)
    window.bridge.reply_finished.connect(finished)
    window.start(model_path, probe=False)
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
