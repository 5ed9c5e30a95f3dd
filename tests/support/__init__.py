"""What the tiers share: fixtures, fakes and builders, imported as `tests.support.NAME` and never by another name."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: docs/, gates/, dashboards/ and the tests' golden files
