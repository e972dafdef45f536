"""Tools an `agent` state's model may call: the shape every kind shares (base), and the kinds."""
