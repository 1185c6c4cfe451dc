"""Files: the one safe reader of torch files and the weights' formats (weights), atomic writes, downloads,
COCO panoptic PNG ids. Imports only visiontf.core."""
