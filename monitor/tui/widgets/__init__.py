"""Dashboard panels and charts."""
