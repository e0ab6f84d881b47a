"""Writing trained weights in formats other tools load (Hugging Face ``transformers``)."""
