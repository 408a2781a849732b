"""Chat content parts a text-only model cannot take: refused with a 400 naming the part,
rather than dropped so that the model answers about an image it never saw."""

from __future__ import annotations

from collections.abc import Sequence

from hearthside.core.server.request_errors import InvalidRequestError
from hearthside.core.server.schemas import ChatMessageIn

SEE_IMAGES = ("see images", "Send text, or load a vision model.")
HEAR_AUDIO = ("hear audio", "Send a transcript, or load a model that takes audio.")
READ_FILES = ("read files", "Send the file's text in a text part instead.")
# Part type → what a text-only model cannot do with it and what to do instead. Chat
# Completions names images `image_url`, the Responses API `input_image`; clients send both.
MEDIA_PARTS = {
    "image_url": SEE_IMAGES,
    "input_image": SEE_IMAGES,
    "input_audio": HEAR_AUDIO,
    "audio": HEAR_AUDIO,
    "file": READ_FILES,
    "input_file": READ_FILES,
}


def check_text_only(messages: Sequence[ChatMessageIn], model_id: str) -> None:
    """Raise InvalidRequestError for the first image, audio or file part in `messages`."""
    for message_index, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        for part_index, part in enumerate(message.content):
            media = MEDIA_PARTS.get(part.type)
            if media is not None:
                cannot, instead = media
                raise InvalidRequestError(
                    f"The model {model_id} reads text only; it cannot {cannot}. {instead}",
                    param=f"messages[{message_index}].content[{part_index}]",
                    code="unsupported_content",
                )
