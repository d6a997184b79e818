"""Widgets of the main window: each shows a model or a controller signal and holds no policy.

Invariant: widgets talk to the engine only through `ChatController` signals and methods.
"""
