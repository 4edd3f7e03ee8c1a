"""actors package."""
