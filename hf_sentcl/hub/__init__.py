"""The Hugging Face Hub: data downloaded from it and exports uploaded to it."""
