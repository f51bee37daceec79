"""The settings machinery every layer declares its environment variables with (config.sections).

The bottom of the project: devices/, pipelines/ and engine/ import it; it imports none of them.
"""

from .sections import (
    Accepts,
    AutoFlag,
    Flag,
    Lower,
    Refused,
    Section,
    SettingsError,
    Variable,
    accepted,
    bounds,
    declared_accepts,
    docs_table,
    lowercase,
    read_section,
    sections,
    setting,
    value_type,
    variables,
)
from .settings_file import Layered, SettingsFileError, environment, layered, settings_path

__all__ = [
    "Accepts",
    "AutoFlag",
    "Flag",
    "Layered",
    "Lower",
    "Refused",
    "Section",
    "SettingsError",
    "SettingsFileError",
    "Variable",
    "accepted",
    "bounds",
    "declared_accepts",
    "docs_table",
    "environment",
    "layered",
    "lowercase",
    "read_section",
    "sections",
    "setting",
    "settings_path",
    "value_type",
    "variables",
]
