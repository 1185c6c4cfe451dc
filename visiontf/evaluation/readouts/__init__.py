"""Detection readouts beyond the 12 COCO numbers: per-class AP, the confusion matrix, TIDE, their pictures."""
