"""The bottom layer: user-facing errors, argument checks, config checks, distributed helpers, lazy exports.
Imports nothing of visiontf."""
