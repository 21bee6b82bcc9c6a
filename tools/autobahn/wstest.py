# Runs Autobahn|Testsuite's wstest under Python 2.7 from the folder the
# suite was installed into (pip --target), given as argv[1]; the rest of
# argv goes to wstest (e.g. -m fuzzingclient -s spec.json).
# A site dir, not sys.path: zope's namespace .pth file must be read.
import site
import sys

site.addsitedir(sys.argv[1])
sys.argv = ["wstest"] + sys.argv[2:]
from autobahntestsuite import wstest  # noqa: E402

wstest.run()
