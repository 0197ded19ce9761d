"""The page served at `/`: static HTML, JavaScript and CSS, a client of the HTTP API (no build step)."""
