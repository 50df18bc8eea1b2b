"""The scaler: keeps each release's machines exactly as long as its lane needs them."""
