"""Data: sources (download), schema checks, reshaping into instances, splits, input formatting."""
