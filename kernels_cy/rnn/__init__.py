"""Recurrent layers: LSTM."""
