"""D-FINE and DEIM: RT-DETR with an HGNetv2 backbone and fine-grained distribution refinement of the box edges."""
