"""cuda_agent package."""
