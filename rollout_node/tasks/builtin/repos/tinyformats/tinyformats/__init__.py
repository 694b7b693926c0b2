"""tinyformats: a tiny CSV reader and INI parser without dependencies."""
