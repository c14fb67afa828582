"""The engine link: the worker processes' connection to the engine process (framing, messages, the hub, the link)."""
