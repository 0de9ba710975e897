"""The human-readable API reference (`GET /docs`): HTML rendered from the app's OpenAPI document, with
its stylesheet shipped in this package (no CDN, no script)."""
