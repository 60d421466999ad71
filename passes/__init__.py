"""passes layer (see DESIGN.md)."""
