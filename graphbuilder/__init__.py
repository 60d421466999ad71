"""graphbuilder layer (see DESIGN.md)."""
