"""Conversations: lifecycle, turns, editing, export/import, versions, the loaded model: the only writer of a
conversation's history, turn numbers and stats. Imports memory, kvcache, runtime, store and the shared leaves."""
