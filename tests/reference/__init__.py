"""What the tests compare visiontf against, besides the live references (HF transformers, timm, pycocotools,
faster-coco-eval, tidecv): outputs that the original projects computed, recorded as fixtures
(:mod:`reference.fixtures`, written by ``scripts/fixtures/make_<family>.py`` from a checkout of the original),
and re-implementations in the project's own words for what a fixture cannot cover (training-mode losses,
gradients, the matcher)."""
