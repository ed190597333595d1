"""SWID 2015 and XML-DSig schemas used to validate RIMs offline."""
