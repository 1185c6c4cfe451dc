"""RT-DETR and RT-DETRv2 (lyuwenyu/RT-DETR): the real-time DETRs; see :mod:`visiontf.models.rtdetr.rtdetr`."""
