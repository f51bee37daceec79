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

__all__ = [
    "Accepts",
    "AutoFlag",
    "Flag",
    "Lower",
    "Refused",
    "Section",
    "SettingsError",
    "Variable",
    "accepted",
    "bounds",
    "declared_accepts",
    "docs_table",
    "lowercase",
    "read_section",
    "sections",
    "setting",
    "value_type",
    "variables",
]
