"""What a dictionary says, measured and shown: its metrics (`metrics.py`; an across dictionary's, `across.py`), the
dictionary spliced into its model and one concept taken out (`splice.py`), two dictionaries' concepts paired
(`match.py`), each concept's top images (`exemplars.py`), its name from them or from CLIP's words (`names.py`) and
one photo's concepts (`photo.py`)."""
