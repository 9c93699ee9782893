"""The gateway: an OpenAI-compatible front for the production model that logs every call (see app.py)."""
