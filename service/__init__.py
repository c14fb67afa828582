"""glassbox: the request path (wire formats, tokenizer, batcher, model, engines, app)."""

__version__ = "0.1.0"
