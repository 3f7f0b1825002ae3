"""Inputs: scan what the user gives (an image folder, ID-labelled files, a listing) into
samples, and check each input file (image sniffing and checks, decoder messages, tensor
files, image re-encoding)."""
