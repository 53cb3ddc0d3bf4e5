"""Command-line interface (thin: parses, calls the library, formats)."""
