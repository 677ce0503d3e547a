"""Built-in trainer algorithms, one readable file each."""
