"""Shipped data: the model catalog (models/*.json) and the hardware catalog (hardware/*.json)."""

from pathlib import Path

DATA_DIR = Path(__file__).parent
