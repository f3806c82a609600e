"""The pure policies: decisions with injected clocks and RNGs, importing no Ray, vLLM, web
framework or asyncio (tests/unit/test_layers.py checks it)."""
