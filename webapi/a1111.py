"""(being written) See webapi/__init__.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter


def router(engine: Any, settings: Any, access: Any) -> APIRouter:
    return APIRouter()
