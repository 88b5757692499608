"""pyzlog.core"""
from pkgutil import extend_path

# the compiled module (pyzlog.core._layout) is installed beside the installed
# copy of this package: a checkout run in place (the tests) finds it there too
__path__ = extend_path(__path__, __name__)
