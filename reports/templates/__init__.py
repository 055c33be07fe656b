"""Package data: the Jinja2 template and stylesheet of report.html (a package so that
setuptools' package-data patterns ship them in the wheel)."""
