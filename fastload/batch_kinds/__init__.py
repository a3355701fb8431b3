"""The kinds of batch one ``fastload.DataLoader`` makes, behind one protocol (:mod:`.protocol`):
samples with their fields (images, masks, labels, clips: :mod:`.samples`) and packed token rows
(:mod:`.tokens`)."""
