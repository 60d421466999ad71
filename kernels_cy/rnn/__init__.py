"""Recurrent layers: RNN, GRU and LSTM."""
