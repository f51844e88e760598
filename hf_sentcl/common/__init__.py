"""Small utilities shared by every layer; nothing here imports the rest of hf_sentcl."""
