"""The browser pages: playground and dashboard (pages.py) and their static files."""
