"""Validated, frozen configuration: hardware profiles, models, formats, run specs.

Only ``loader`` reads YAML. Everything downstream receives frozen pydantic objects.
"""
