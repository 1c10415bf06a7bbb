"""Read-only tools an investigation may call (:mod:`bot.investigate`): one registry, JSON schemas,
the channel's scope, redaction and an output cap applied to every call alike.

Rooms: :mod:`bot.tools.base` (the :class:`~bot.tools.base.Tool` seam, scope, argument helpers),
:mod:`bot.tools.kubernetes`, :mod:`bot.tools.prometheus`, :mod:`bot.tools.documents` (runbooks,
the chat thread), :mod:`bot.tools.registry` (which tools, and the one path every call takes).
"""
