"""The Jev ``/v1/systemone`` wire format and the HTTP server built on it."""
