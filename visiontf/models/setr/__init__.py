"""SETR (mmsegmentation's layout): the model, its heads, its weights' conversion, SETR on any backbone."""
