"""Evoke Desk's resources as an installed package, `evoke_resources` (pyproject maps it onto this folder):
icons, style sheet, default system prompt, tool schemas, demo files. Data only: read it with
`importlib.resources.files("evoke_resources")` (through `evoke_engine.package_files.resources_root`)."""
