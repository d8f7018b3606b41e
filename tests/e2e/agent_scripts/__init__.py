"""Scripts that the end-to-end tests run as training programs; hang_worker is also imported."""
