"""The official openai client as an app uses it (sync, in a worker thread)."""

from __future__ import annotations

from dataclasses import dataclass

from openai import OpenAI


@dataclass(frozen=True, slots=True, kw_only=True)
class Answers:
    """What one round of chat and text completions, streaming and not, returned."""

    chat_role: str
    chat_content: str | None
    chat_prompt_tokens: int
    chat_completion_tokens: int
    text_completion_tokens: int
    chat_deltas: list[str]
    chat_stream_tokens: int | None
    stream_finish_reason: str | None
    text_pieces: list[str]
    text_stream_tokens: int | None
    models: list[str]


def chat_and_completions(base_url: str, *, model: str, api_key: str = "unused") -> Answers:
    """Non-streaming and streaming chat and text completions against
    ``base_url`` (ending before ``/v1``). ``ignore_eos`` makes every answer
    exactly ``max_tokens`` long: random weights stop anywhere otherwise."""
    ignore_eos = {"ignore_eos": True}
    with OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=60) as client:
        chat = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=12,
            extra_body=ignore_eos,
        )
        text = client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=10, extra_body=ignore_eos
        )
        chat_deltas: list[str] = []
        chat_stream_tokens = text_stream_tokens = None
        finish_reason = None
        for chunk in client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Count to three."}],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=ignore_eos,
        ):
            if chunk.choices:
                if chunk.choices[0].delta.content:
                    chat_deltas.append(chunk.choices[0].delta.content)
                finish_reason = chunk.choices[0].finish_reason or finish_reason
            if chunk.usage is not None:
                chat_stream_tokens = chunk.usage.completion_tokens
        text_pieces: list[str] = []
        for piece in client.completions.create(
            model=model,
            prompt="The queue",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=ignore_eos,
        ):
            if piece.choices and piece.choices[0].text:
                text_pieces.append(piece.choices[0].text)
            if piece.usage is not None:
                text_stream_tokens = piece.usage.completion_tokens
        models = [m.id for m in client.models.list()]
    assert chat.usage is not None
    assert text.usage is not None
    return Answers(
        chat_role=chat.choices[0].message.role,
        chat_content=chat.choices[0].message.content,
        chat_prompt_tokens=chat.usage.prompt_tokens,
        chat_completion_tokens=chat.usage.completion_tokens,
        text_completion_tokens=text.usage.completion_tokens,
        chat_deltas=chat_deltas,
        chat_stream_tokens=chat_stream_tokens,
        stream_finish_reason=finish_reason,
        text_pieces=text_pieces,
        text_stream_tokens=text_stream_tokens,
        models=models,
    )


def assert_full_round(answers: Answers) -> None:
    """The round of :func:`chat_and_completions` came back whole."""
    assert answers.chat_role == "assistant"
    assert isinstance(answers.chat_content, str)
    assert answers.chat_completion_tokens == 12
    assert answers.chat_prompt_tokens > 3  # the ChatML template wraps the message
    assert answers.text_completion_tokens == 10
    # Streaming: one event per token, except that byte tokens wait for the
    # rest of their character; the usage comes last, with every token.
    assert answers.chat_stream_tokens == 8
    assert 2 <= len(answers.chat_deltas) <= 8
    assert answers.stream_finish_reason == "length"
    assert answers.text_stream_tokens == 6
    assert 2 <= len(answers.text_pieces) <= 6
