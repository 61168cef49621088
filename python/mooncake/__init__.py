"""Drop-in replacement for Mooncake's Python transfer engine, backed by te.

    from mooncake.engine import TransferEngine

Connectors written for Mooncake (vLLM's and SGLang's) run unchanged; see
mooncake/engine.py for the methods and their return conventions.
"""
