"""Reports: terminal tables, progress bars, Markdown, HTML and plots."""
