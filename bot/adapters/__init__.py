"""Chat platform adapters: each turns platform events into ``IncomingMessage`` and renders replies."""
