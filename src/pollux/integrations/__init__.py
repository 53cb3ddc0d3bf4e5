"""Adapters that make jobs written for training frameworks adaptive under Pollux.

Each framework lives in its own module, imported only by name, so that ``pollux`` itself
never needs the framework: ``pollux.integrations.transformers`` (extra ``[transformers]``)
and ``pollux.integrations.lightning`` (extra ``[lightning]``).
"""
